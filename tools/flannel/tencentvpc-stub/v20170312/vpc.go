// Package v20170312 stands in for the Tencent Cloud VPC SDK, whose version
// flannel v0.28.10 requires (v1.3.188) the module proxy refuses. It holds
// only the names flannel's tencentvpc backend uses, so flanneld builds; the
// backend fails at start if chosen. The real-cluster tier runs the vxlan
// backend only.
package v20170312

import "errors"

// Filter, Route and RouteTable carry the fields the backend reads or sets.
type Filter struct {
	Name   *string
	Values []*string
}

type Route struct {
	DestinationCidrBlock *string
	GatewayType          *string
	GatewayId            *string
	RouteType            *string
	RouteId              *uint64
	Enabled              *bool
}

type RouteTable struct {
	RouteTableId *string
	RouteSet     []*Route
}

type DescribeRouteTablesRequest struct{ Filters []*Filter }

type DescribeRouteTablesResponse struct {
	Response *struct{ RouteTableSet []*RouteTable }
}

type DeleteRoutesRequest struct {
	RouteTableId *string
	Routes       []*Route
}

type DeleteRoutesResponse struct{}

type CreateRoutesRequest struct {
	RouteTableId *string
	Routes       []*Route
}

type CreateRoutesResponse struct{}

func NewDescribeRouteTablesRequest() *DescribeRouteTablesRequest {
	return &DescribeRouteTablesRequest{}
}
func NewDeleteRoutesRequest() *DeleteRoutesRequest { return &DeleteRoutesRequest{} }
func NewCreateRoutesRequest() *CreateRoutesRequest { return &CreateRoutesRequest{} }

// Client refuses every call.
type Client struct{}

var errStub = errors.New("tencentvpc: not built in (the SDK module is not served by the module proxy)")

func NewClientWithSecretId(id, key, region string) (*Client, error) { return nil, errStub }

func (*Client) DescribeRouteTables(*DescribeRouteTablesRequest) (*DescribeRouteTablesResponse, error) {
	return nil, errStub
}
func (*Client) DeleteRoutes(*DeleteRoutesRequest) (*DeleteRoutesResponse, error) { return nil, errStub }
func (*Client) CreateRoutes(*CreateRoutesRequest) (*CreateRoutesResponse, error) { return nil, errStub }
